"""MiniMax-H3's sound: the audio VAE (``AutoencoderKLMiniMaxH3Audio``: ``modules``), its config
(``config``), loading from a pipeline folder's ``audio_vae/`` or seeded random weights
(``weights``), the pipeline's decode and encode paths, normalised latents to and from a stereo
waveform (``pipeline``), and those paths as the service serves them (``sound``).

A sound family (``models.sound``): it exports a ``SoundFamily``, not a ``FamilyDescriptor``. Its
latents ``(channels, C, L)`` decode to a waveform, not frames, and ``models.config.VAEConfig`` (which
the video registry, the server's video programs and the memory estimate read) describes video and
image VAEs only. The registry lists it among the sound families; MiniMax-H3's embedded model names it.
"""

from vaeserve.models.sound import SoundFamily

from .config import MiniMaxH3AudioConfig

SOUND = SoundFamily(folder="minimax_h3_audio", title="MiniMax-H3 audio VAE", components=("audio_vae",),
                    class_names=(MiniMaxH3AudioConfig.class_name,), load="sound:load_sound", random="sound:random_sound")
