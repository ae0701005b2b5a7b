"""From a request to a report: one path per kind of question.

blocks.py: blocktrace's own blocks or a user's block — traces, gradients, compare.
model.py: a checkpoint as a whole model — every layer checked, the model's own loss.
"""

from blocktrace.pipeline.blocks import compare_request, make_blocks, place_blocks, run_request
from blocktrace.pipeline.model import check_model_request

__all__ = ["check_model_request", "compare_request", "make_blocks", "place_blocks", "run_request"]
