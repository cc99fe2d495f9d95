"""The one error the GDN torch ops raise for an option SGLang's kernels have and these ops do not."""


class UnsupportedGdnOption(ValueError):
    """An argument combination the torch GDN ops do not implement; the message names it in one line."""
