"""Lesson 18's torch side: a store that outlives any rank, heartbeats, and the survivors' quorum.

torch's default store is a TCPStore served by rank 0, so it dies with rank 0. Here the store is a
torch FileStore in the run folder (one file, served by no process), so any rank may die, rank 0 too.
Every rank bumps a counter in it every BEAT_S from a thread of its own (its heartbeat). A survivor
that lost a peer joins round `epoch` with the step it was in; the round closes once each rank of the old
world has joined or its heartbeat has stood still for STALE_S. The first survivor to see that writes
the member list with compare_set, so every survivor reads the same list, whoever wrote it.

How torchft's quorum maps to this (read in pytorch/torchft: src/lighthouse.rs, torchft/manager.py):
  its Lighthouse, a server of its own      this FileStore, a file of its own: no rank holds it
  heartbeats, dead after 5 s by default    beat/<rank> counters, dead after STALE_S standing still
  a quorum: the replicas that asked, once  a round: the ranks that joined, once every rank of the
    every one heartbeating has asked, or     old world has joined or is stale (a killed rank never
    at its join timeout (60 s by default)    joins; no join timeout is needed: a live rank joins)
  min_replicas, and more than half of the  (not here: the lesson's world only ever shrinks)
    heartbeating replicas (no split brain)
  a new quorum_id; the Manager re-makes    round `epoch`; a new ProcessGroupGloo on the prefix
    its group on the store prefix            epoch<k>/
    <store>/torchft/<quorum_id>/<rank>
  should_commit: the optimizer steps only  the interrupted step is never applied: it is redone on
    if every replica agrees the step is ok   the new group, with the batch split over the survivors
"""
import datetime
import json
import os
import tempfile
import threading
import time

BEAT_S = 0.1       # a heartbeat every BEAT_S seconds
STALE_S = 2.0      # a heartbeat that stood still this long is a dead rank's
QUORUM_S = 60.0    # no quorum after this long: give up with a line (never hang)


def store_path(comm, rank):
    """A file every rank can open, chosen before any rank dies: in the run folder, or a new temp
    folder of rank 0's (a run by hand on one machine). Collective over the MPI world."""
    run_dir = os.environ.get("TUTOR_RUN_DIR")
    if run_dir and os.path.isdir(run_dir):
        return os.path.join(run_dir, "ft-store")
    return comm.bcast(os.path.join(tempfile.mkdtemp(prefix="tutor-ft-"), "store") if rank == 0 else None, root=0)


class Quorum:
    """The FileStore, this rank's heartbeat thread, and the rounds of agreement."""

    def __init__(self, path, me, timeout_s):
        import torch.distributed as dist
        self.dist, self.path, self.me = dist, path, me
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.FileStore(path, -1)
        beat = dist.FileStore(path, -1)  # the thread's own handle: no lock shared with the main thread
        self.alive, self.groups = True, []
        threading.Thread(target=self._beat, args=(beat,), daemon=True).start()

    def _beat(self, store):
        while self.alive:
            store.add(f"beat/{self.me}", 1)
            time.sleep(BEAT_S)

    def group(self, epoch, rank, size):
        """A gloo process group of `size` ranks on keys of its own (prefix epoch): a round's group
        never meets a key the old group left behind."""
        prefixed = self.dist.PrefixStore(f"epoch{epoch}/", self.store)
        self.groups.append(self.dist.ProcessGroupGloo(prefixed, rank, size, self.timeout))
        return self.groups[-1]  # kept: freeing a failed group joins its threads, which wait out the timeout

    def agree(self, epoch, members, step):
        """(survivors' original ranks in order, the step each of them was in): the same on every
        survivor. `members`: the original ranks of the world that just failed."""
        s, key = self.store, f"round{epoch}"
        s.set(f"{key}/step/{self.me}", str(step))
        s.add(f"{key}/joined/{self.me}", 1)
        last, since, t0 = {}, {}, time.monotonic()
        while not s.check([f"{key}/decided"]):
            now = time.monotonic()
            if now - t0 > QUORUM_S:
                raise RuntimeError(f"no quorum after {QUORUM_S:g} s in round {epoch}")
            joined = [r for r in members if s.check([f"{key}/joined/{r}"])]
            for r in members:  # a heartbeat that moved restarts its clock
                beats = s.add(f"beat/{r}", 0)
                if beats != last.get(r):
                    last[r], since[r] = beats, now
            if all(r in joined or now - since[r] >= STALE_S for r in members):
                steps = {r: int(s.get(f"{key}/step/{r}")) for r in joined}
                s.compare_set(f"{key}/decided", "", json.dumps(steps))  # the first writer wins
            time.sleep(BEAT_S / 2)
        steps = {int(r): v for r, v in json.loads(s.get(f"{key}/decided")).items()}
        if self.me not in steps:
            raise RuntimeError(f"rank {self.me} joined round {epoch} after its quorum closed")
        return sorted(steps), [steps[r] for r in sorted(steps)]

    def gather(self, members, row):
        """Each survivor's row (a dict), in member order, on the first member; None elsewhere."""
        self.store.set(f"row/{self.me}", json.dumps(row))
        if self.me != members[0]:
            return None
        self.store.wait([f"row/{r}" for r in members], datetime.timedelta(seconds=QUORUM_S))
        return [json.loads(self.store.get(f"row/{r}")) for r in members]

    def barrier(self, key, count):
        """Return once `count` ranks have called barrier(key)."""
        self.store.add(key, 1)
        t0 = time.monotonic()
        while self.store.add(key, 0) < count and time.monotonic() - t0 < QUORUM_S:
            time.sleep(BEAT_S / 2)

    def close(self):
        self.alive = False
