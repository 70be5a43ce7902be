"""How the environment spells on and off: the one list, for every switch and option.

A leaf (it imports nothing), because the autoload entry point reads it on every
``import torch``.

Example::

    >>> "off" in OFF_WORDS, "yes" in ON_WORDS
    (True, True)
"""

ON_WORDS = frozenset({"1", "true", "yes", "on"})
OFF_WORDS = frozenset({"", "0", "false", "no", "off"})

__all__ = ["ON_WORDS", "OFF_WORDS"]
