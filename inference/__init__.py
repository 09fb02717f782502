"""Model code: pre-processing, the model, post-processing. Imports neither Celery nor Flask."""

from inference.encoder import Encoder, default_model_path
from inference.zero_shot import ZeroShotClassifier

__all__ = ["Encoder", "ZeroShotClassifier", "default_model_path"]
