"""The arm64 side of :mod:`circle_fx.circle.arm64`: a persistent onert worker run by the
aarch64 Python under qemu-user. It imports only numpy and onert (the arm64 site has nothing
else; circle_fx itself is never imported there) and answers pickled requests on stdin.

Request ``(op, *args)`` -> reply ``("ok", result)`` or ``("err", message)``:
``open(path, bound)`` -> handle; ``infer(h, arrays)`` -> outputs (onert's ``infer()``);
``run(h, {index: array})`` -> every output (``set_input`` by pointer, ``run``, ``get_output``:
the low-level path the LLM runner uses); ``close(h)``; ``quit``.
The protocol owns the process's original stdout; fd 1 is pointed at stderr so that whatever
onert's C++ code prints cannot corrupt a reply.
"""
import os
import pickle
import sys


def main() -> None:
    proto = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    # ggml threads wait on busy cores (docs/onert-findings.md); under emulation one thread is the sane default
    os.environ.setdefault("NUM_THREADS", "1")
    os.environ.setdefault("USE_MMAPED_DATA", "1")
    import numpy as np
    import onert
    from onert.native.libnnfw_api_pybind import prepare_config

    sessions, bound = {}, {}

    def open_(path, low_level):
        s = onert.infer.session(path, "cpu")
        if low_level:
            s = s.session
            s.set_prepare_config(prepare_config.ENABLE_INTERNAL_OUTPUT_ALLOC)
            s.prepare()
        h = len(sessions) + 1
        sessions[h], bound[h] = s, {}
        return h

    def run(h, arrays):
        s = sessions[h]
        for i, a in arrays.items():
            a = np.ascontiguousarray(a)
            s.set_input(i, a)
            bound[h][i] = a  # onert keeps the pointer: keep the array alive
        s.run()
        return [np.array(s.get_output(i)) for i in range(s.output_size())]

    ops = {
        "open": open_,
        "infer": lambda h, arrays: [np.asarray(o) for o in sessions[h].infer([np.ascontiguousarray(a) for a in arrays])],
        "run": run,
        "close": lambda h: (sessions.pop(h, None), bound.pop(h, None)) and None,
        "ping": lambda: {"machine": os.uname().machine, "onert": onert.__file__, "numpy": np.__version__},
    }
    while True:
        try:
            req = pickle.load(requests)
        except EOFError:
            return
        if req[0] == "quit":
            return
        try:
            reply = ("ok", ops[req[0]](*req[1:]))
        except Exception as e:  # reported to the host, which raises RuntimeFailure
            reply = ("err", f"{type(e).__name__}: {e}")
        pickle.dump(reply, proto, protocol=pickle.HIGHEST_PROTOCOL)
        proto.flush()


if __name__ == "__main__":
    main()
