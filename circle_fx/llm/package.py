""":class:`LLMPackage`: the prefill and decode Circle models plus their manifest.

Right after ``export_llm`` it holds the two :class:`~circle_fx.CircleModel` objects;
after ``LLMPackage.load(dir)`` it holds only file paths (nothing is re-exported).
``save(dir)`` writes ``prefill.circle``, ``decode.circle`` (each atomically), the text files
(``tokenizer.json``, ``chat_template.jinja``, ``generation_config.json``: ``assets``) and then
``manifest.json`` last, so a directory with a manifest always has every file it names.
"""
from __future__ import annotations

import os
import shutil

from . import manifest as mf


class LLMPackage:
    def __init__(self, manifest: dict, decode=None, prefill=None, directory: str | None = None,
                 assets: dict[str, str] | None = None):
        self.manifest = manifest
        self.decode = decode
        self.prefill = prefill
        self.directory = directory
        self.assets = dict(assets or {})  # file name -> text contents, written next to the models

    @classmethod
    def load(cls, directory) -> "LLMPackage":
        directory = os.fspath(directory)
        return cls(mf.read(directory), directory=directory)

    def save(self, directory) -> str:
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        for part, model in (("prefill", self.prefill), ("decode", self.decode)):
            dest = os.path.join(directory, self.manifest[part]["file"])
            if model is not None:
                model.save(dest)
            elif self.directory and os.path.abspath(self.directory) != os.path.abspath(directory):
                shutil.copyfile(os.path.join(self.directory, self.manifest[part]["file"]), dest)
        for name in mf.asset_files(self.manifest):
            dest = os.path.join(directory, name)
            if name in self.assets:
                _write_text(dest, self.assets[name])
            elif self.directory and os.path.abspath(self.directory) != os.path.abspath(directory):
                shutil.copyfile(os.path.join(self.directory, name), dest)
        mf.write(directory, self.manifest)
        self.directory = self.directory or directory
        return directory

    def path(self, part: str) -> str:
        if self.directory is None:
            raise ValueError("the package has not been saved yet")
        return os.path.join(self.directory, self.manifest[part]["file"])

    def runner(self, directory: str | None = None, runtime=None):
        """An :class:`~circle_fx.llm.runner.LLMRunner` on this package (saved to a temp dir first if
        needed); ``runtime``: as ``LLMRunner``'s (e.g. :class:`circle_fx.circle.arm64.Arm64Runtime`)."""
        from .runner import LLMRunner

        if self.directory is None:
            import tempfile

            self.save(directory or tempfile.mkdtemp(prefix="circle_fx_llm_"))
        return LLMRunner(self.directory, runtime=runtime)

    def __repr__(self) -> str:
        m = self.manifest
        return (f"<LLMPackage {m['model']['architecture']} layers={m['model']['num_layers']} "
                f"max_seq_len={m['max_seq_len']} prefill_len={m['prefill_len']}>")


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
