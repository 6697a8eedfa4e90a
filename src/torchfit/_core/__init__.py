"""The bottom layer, torch only: units and dtypes, the step, the tensor walk, the storage ledger.

Everything else in torchfit builds on these modules; they import nothing from the rest of
the package.
"""
