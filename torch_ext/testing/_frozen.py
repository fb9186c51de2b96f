"""Imported last by run_ranks' forkserver (its preloads): what the preloads made is frozen out of the
garbage collector's work (``gc.freeze``), so a rank's full collections do not walk torch's objects, nor
write to (and so copy) the pages that hold them."""
import gc

gc.freeze()
