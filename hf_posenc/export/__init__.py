"""Serving and exporting a patched model: what the engines read.

    serving.py       what vLLM and llama.cpp run for a patch: config overrides, llama.cpp flags, a GGUF re-headed
    gguf_writer.py   a saved checkpoint written whole as a GGUF file (weights, rope metadata, factor tensors)
    gguf_header.py   GGUF headers read and written: the rope keys llama.cpp reads
    gguf_tokenizer.py  a Hugging Face tokenizer written as a GGUF file's tokenizer (byte-level BPE)

Nothing is imported here: `from hf_posenc.export import serving` loads what it names.
"""
