"""torch.distributed's orderly end, at exit: while Python still runs, before mpi4py's MPI_Finalize.
bootstrap.init_torch calls register() once per process, before the process group exists.

Why: gloo's worker threads drop each finished collective's work themselves, and with it tensors
Python owns, which takes the GIL. A thread that asks for the GIL once the interpreter is shutting
down is ended on the spot, and C++ cannot unwind that through a destructor: std::terminate
("terminate called without an active exception"), SIGABRT after every check passed, whenever a
worker is late (a busy core). Freed while Python runs, the group finishes its queued work, joins its
threads (the GIL released) and closes its store (rank 0's TCPStore server thread). No barrier:
report.finish's gather has already met every rank. Freeing the group means dropping every
reference to it:
  torch's own          destroy_process_group (report.finish already does, on --api torch);
  modules in cycles    gc.collect (DDP's and fully_shard's hooks);
  DTensor's caches     keep each DeviceMesh for the process's life, and a mesh keeps its groups;
  default arguments    torch.distributed.nn.functional, imported after init (DDP imports it), would
                       hold the group as its functions' `group=` default: register() imports it
                       first, while that default is None.
"""
import atexit
import sys

_registered = []


def register():
    """end_torch at exit, once per process; and the one import that must precede the group."""
    import torch.distributed.nn.functional  # noqa: F401  (its `group=` defaults: see above)
    if not _registered:
        _registered.append(atexit.register(end_torch))


def end_torch():
    """Free the process group while Python still runs; or, when an uncaught error is ending this
    process, end every rank at once."""
    if getattr(sys, "last_value", None) is not None:
        # its error line is written: end every rank now, as mpi4py would after Python's end, for
        # freeing the group waits for its workers, and one may be inside a collective that no peer
        # will join (that hung the run until the runner's timeout)
        from mpi4py import MPI
        if not MPI.Is_finalized():
            MPI.COMM_WORLD.Abort(1)
    import gc

    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    mesh = sys.modules.get("torch.distributed.device_mesh")
    # type(o) is, not isinstance: that would run torch's own __instancecheck__ on every object (warnings)
    for held in [o for o in gc.get_objects() if mesh and type(o) is mesh.DeviceMesh]:
        getattr(held, "_pg_registry", {}).clear()  # a mesh kept in a cache may keep nothing else
    gc.collect()
