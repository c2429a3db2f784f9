"""The one exception type of the evaluation code.

Every expected failure (no export at the path, a shape or tokenizer mismatch, task data
missing, a standard task requested without the Hugging Face hub) raises `EvalError` with a
one-line message naming the problem and the fix; `pipelines.evaluate` prints it as
`error: ...` and exits non-zero instead of showing a stack trace.
"""


class EvalError(Exception):
    """A user-fixable problem with an evaluation's inputs."""
