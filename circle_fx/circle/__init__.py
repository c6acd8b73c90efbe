"""The Circle artifact: schema facts, reading a file back, verifying, inspecting, running it.

Nothing here imports torch or the emitter: these modules describe what is in a ``.circle``
file (any file, not only ones circle_fx wrote), so they stay usable on a deployment host
and cannot silently agree with the emitter by sharing its code paths.
"""
