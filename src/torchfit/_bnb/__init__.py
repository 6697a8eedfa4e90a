"""bitsandbytes' rules, shared by `torchfit.memory` and `torchfit.quantize`.

`layout`: the bytes a quantized layer holds (packed weights, absmax, code books, row
scales). `selection`: which layers a transformers / bitsandbytes load quantizes (the skip
list) and the settings that decide it. Pure arithmetic and module inspection: importing
this package loads neither bitsandbytes nor transformers.
"""
