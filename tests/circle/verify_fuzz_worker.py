"""Fuzzes ``circle_fx.verify`` with hypothesis; run as a separate process by test_verify_fuzz.

``python verify_fuzz_worker.py N DERANDOMIZE FILE...``: for each strategy (random bytes, with
and without a Circle header; truncations at every kind of offset; bit flips; overwritten
4-byte words, where offsets live) N examples built from the given real Circle files.
``verify`` must return or raise ``VerifyError``; anything else is printed with the example
and the process exits 1. A crash of the interpreter (onert-style segfault in a reader)
shows up as a negative exit code in the parent.
"""
from __future__ import annotations

import sys
import traceback

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circle_fx
from circle_fx.errors import VerifyError


_last_failure = ""


def check(data: bytes) -> None:
    global _last_failure
    try:
        circle_fx.verify(bytes(data))
    except VerifyError:
        pass
    except Exception:
        _last_failure = traceback.format_exc()
        raise


def main(n: int, derandomize: bool, paths: list[str]) -> None:
    files = [open(p, "rb").read() for p in paths]
    config = settings(max_examples=n, derandomize=derandomize, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))
    real = st.sampled_from(files)

    @config
    @given(st.binary(max_size=4096), st.booleans())
    def random_bytes(data, header):
        check((data[:4].ljust(4, b"\0") + b"CIR0" + data[8:]) if header else data)

    @config
    @given(real, st.data())
    def truncations(data, draw):
        # offset classes: the header, the flatbuffer tables near the start, anywhere,
        # 4-byte aligned (a cut between fields), and the last bytes (inside the weights)
        cut = draw.draw(st.one_of(st.integers(0, 16), st.integers(0, min(len(data), 2048)),
                                  st.integers(0, len(data) - 1), st.integers(0, (len(data) - 1) // 4).map(lambda k: 4 * k),
                                  st.integers(max(0, len(data) - 64), len(data) - 1)))
        check(data[:cut])

    @config
    @given(real, st.data())
    def bit_flips(data, draw):
        b = bytearray(data)
        for _ in range(draw.draw(st.integers(1, 8))):
            b[draw.draw(st.integers(0, len(b) - 1))] ^= 1 << draw.draw(st.integers(0, 7))
        check(b)

    @config
    @given(real, st.data())
    def overwritten_words(data, draw):
        b = bytearray(data)
        k = draw.draw(st.integers(0, len(b) // 4 - 1))
        value = draw.draw(st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 64), st.integers(2**32 - 64, 2**32 - 1)))
        b[4 * k:4 * k + 4] = value.to_bytes(4, "little")
        check(b)

    for fuzz in (random_bytes, truncations, bit_flips, overwritten_words):
        try:
            fuzz()
        except Exception:
            print(f"{fuzz.__name__}: verify raised something other than VerifyError (last one):\n"
                  f"{_last_failure}", flush=True)
            raise
        print(f"{fuzz.__name__}: {n} examples OK", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:])
