"""The wire contract between coordinator and clients: the envelopes (``messages``), the named tensors
they carry (``tensors``) and the exported model card (``model_card``). Imports nothing else of ``common``."""
