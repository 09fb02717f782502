"""Model code: pre-processing, the models, post-processing. Imports neither Celery nor Flask."""

from inference.encoder import Encoder, default_model_path
from inference.pipeline import Pipeline

__all__ = ["Encoder", "Pipeline", "default_model_path"]
