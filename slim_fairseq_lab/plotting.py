"""matplotlib for the lab's plots: the file-only Agg backend, its font-cache chatter silenced."""


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend (no display needed)."""
    import logging
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
