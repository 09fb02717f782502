"""Model code: pre-processing, the models, post-processing. Imports neither Celery nor Flask.

Empty on purpose: importing a torch-free part (inference.stages) must not import torch and
transformers, so each model and the pipeline are imported from their own modules
(inference.encoder, inference.pipeline).
"""
