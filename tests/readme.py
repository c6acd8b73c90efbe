"""The README's ``python`` code blocks, for the tests that execute or inspect them."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    """Every fenced ```` ```python ```` block of the README, in order."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def py_blocks() -> list[str]:
    """Every fenced ```` ```py ```` block (shown, not executed: e.g. a file's code quoted whole)."""
    return re.findall(r"```py\n(.*?)```", README.read_text(), flags=re.S)
