"""Text for a terminal 100 columns wide: the one width, and paragraphs wrapped to it.

    print(text.wrapped("a long sentence ..."))               # continuation lines indented 2
    print(text.wrapped(line, indent="  ", hang=4))           # indented, continuations 4 further
    print(text.fit(line))                                    # one line, cut with " ..." past WIDTH

Every line the kit prints fits WIDTH (tests/readable.py holds the runs to it); the JSON keeps values whole.
Where the terminal cannot print a mark (PYTHONIOENCODING=latin-1, a C locale), plain_marks(sys.stdout)
makes the stream write a look-alike ('✓' as '+') instead of failing; the runner (common/runner/terminal.py)
and every lesson (common/report.py) call it when they load.
"""
import codecs
import textwrap
import unicodedata

WIDTH = 100  # columns: every printed line fits


def wrapped(text, indent="", hang=2, width=WIDTH):
    """text filled to `width`, each newline-separated paragraph on its own; continuation lines indented
    `hang` more than `indent`. Hyphenated words ("ping-pong", "all-reduce") stay whole."""
    return "\n".join(textwrap.fill(part, width, initial_indent=indent, subsequent_indent=indent + " " * hang,
                                   break_on_hyphens=False) for part in text.split("\n"))


def fit(line, width=WIDTH):
    """One line, cut to `width` with ' ...' where it is longer."""
    return line if len(line) <= width else line[:width - 4] + " ..."


# what the kit's marks become on a terminal that cannot print them (PYTHONIOENCODING=latin-1, a
# C locale): look-alikes of one column where a table's alignment depends on it
ASCII = {"✓": "+", "✗": "x", "…": "...", "–": "-", "—": "-", "×": "x", "→": "->", "←": "<-", "≤": "<=",
         "≥": ">=", "≈": "~", "±": "+-", "·": ".", "α": "a", "β": "b", "γ": "g", "µ": "u", "μ": "u"}


def _look_alike(err):
    """A codec error handler: each character the stream cannot encode as its ASCII look-alike."""
    text = err.object[err.start:err.end]
    return "".join(ASCII.get(ch) or unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
                   or "?" for ch in text), err.end


codecs.register_error("tutor-ascii", _look_alike)


def plain_marks(*streams):
    """Make each text stream whose encoding is not a UTF write look-alikes (ASCII) for what it cannot
    encode instead of raising UnicodeEncodeError after a run has passed; a UTF stream is left alone."""
    for stream in streams:
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        if encoding and not encoding.startswith("utf") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="tutor-ascii")
            except (ValueError, OSError):  # closed, or not a TextIOWrapper after all: leave it as it is
                pass
