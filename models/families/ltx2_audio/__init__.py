"""LTX-2's sound: the audio VAE (``AutoencoderKLLTX2Audio``: ``modules``), the vocoders
(``LTX2Vocoder``, ``LTX2VocoderWithBWE``: ``vocoder``), their configs (``config``), loading from a
pipeline folder's ``audio_vae/`` and ``vocoder/`` (``weights``), and the pipeline's decode path,
latents to waveform (``pipeline``).

A family folder the registry does not list, so it exports no descriptor: its latents
``(B, C, L, M)`` decode to a waveform, not frames, and ``models.config.VAEConfig`` (which the
registry, the server and the memory estimate read) describes video and image VAEs only.
"""
