"""``python -m corral._zygote MODULE...``: the zygote process (:mod:`._template`)."""

# The imported module's main, not a __main__ copy: the children run code that imports
# corral._zygote's modules and must see the same ones.
from corral._zygote._template import main

main()
