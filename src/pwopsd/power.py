"""``python -m pwopsd.power``: how many training and eval seeds detect a given difference
(:mod:`pwopsd.report.power`)."""

from pwopsd.report.power import main

if __name__ == "__main__":
    main()
