"""MiniMax-H3's sound: the audio VAE (``AutoencoderKLMiniMaxH3Audio``: ``modules``), its config
(``config``), loading from a pipeline folder's ``audio_vae/`` or seeded random weights
(``weights``), and the pipeline's decode and encode paths, normalised latents to and from a stereo
waveform (``pipeline``).

A family folder the registry does not list, so it exports no descriptor: its latents
``(channels, C, L)`` decode to a waveform, not frames, and ``models.config.VAEConfig`` (which the
registry, the server and the memory estimate read) describes video and image VAEs only.
"""
