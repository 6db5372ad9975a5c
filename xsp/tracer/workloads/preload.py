"""Imported by the campaign's fork server: the modeling code of every transformers family in
the zoo, so that each forked level-set process finds it imported.

``import transformers`` is lazy: the first model a process builds imports its modeling module
with ``transformers.modeling_utils`` and the generation code (on the H200 image that pulls in
scikit-learn), about 1–2 s in every level-set process of a transformers job, which was most
of their start-up in the campaign of job 12. Importing the classes touches no GPU: nothing
here initializes CUDA, which a forking server must not.
"""

from __future__ import annotations

from xsp.tracer.workloads import names

__all__ = ["import_model_classes"]


def import_model_classes() -> None:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    for name in names.TRANSFORMERS_TEXT + names.TRANSFORMERS_SEQ2SEQ + names.TRANSFORMERS_VISION:
        MODEL_MAPPING[type(AutoConfig.for_model(name))]


import_model_classes()
