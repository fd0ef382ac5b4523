"""LTX-2's sound: the audio VAE (``AutoencoderKLLTX2Audio``: ``modules``), the vocoders
(``LTX2Vocoder``, ``LTX2VocoderWithBWE``: ``vocoder``), their configs (``config``), loading from a
pipeline folder's ``audio_vae/`` and ``vocoder/`` (``weights``), the pipeline's decode path,
latents to waveform (``pipeline``), and that path as the service serves it (``sound``).

A sound family (``models.sound``): it exports a ``SoundFamily``, not a ``FamilyDescriptor``. Its
latents ``(B, C, L, M)`` decode to a waveform, not frames, and ``models.config.VAEConfig`` (which the
video registry, the server's video programs and the memory estimate read) describes video and image
VAEs only. The registry lists it among the sound families; LTX-2's embedded model names it.
"""

from vaeserve.models.sound import SoundFamily

from .config import LTX2AudioVAEConfig

SOUND = SoundFamily(folder="ltx2_audio", title="LTX-2 audio VAE and vocoder", components=("audio_vae", "vocoder"),
                    class_names=(LTX2AudioVAEConfig.class_name,), load="sound:load_sound", random="sound:random_sound")
