"""Text for a terminal 100 columns wide: the one width, and paragraphs wrapped to it.

    print(text.wrapped("a long sentence ..."))               # continuation lines indented 2
    print(text.wrapped(line, indent="  ", hang=4))           # indented, continuations 4 further
    print(text.fit(line))                                    # one line, cut with " ..." past WIDTH

Every line the kit prints fits WIDTH (tests/readable.py holds the runs to it); the JSON keeps values whole.
"""
import textwrap

WIDTH = 100  # columns: every printed line fits


def wrapped(text, indent="", hang=2, width=WIDTH):
    """text filled to `width`, each newline-separated paragraph on its own; continuation lines indented
    `hang` more than `indent`. Hyphenated words ("ping-pong", "all-reduce") stay whole."""
    return "\n".join(textwrap.fill(part, width, initial_indent=indent, subsequent_indent=indent + " " * hang,
                                   break_on_hyphens=False) for part in text.split("\n"))


def fit(line, width=WIDTH):
    """One line, cut to `width` with ' ...' where it is longer."""
    return line if len(line) <= width else line[:width - 4] + " ..."
