"""python -m pwopsd.cost: the cost plan (:func:`pwopsd.cost.main`)."""

from pwopsd.cost import main

main()
