"""The modelled engine releases' tables (<engine>-<version>.json), written by
`python -m enginetables.extract` and read through lab.engines.tables. A package only so
that the tables ship with the code."""
