"""Layout: where a tensor's dim order is decided, apart from the generic passes.

Circle's convolutions and pools are channels-last; torch's are channels-first. The
decompositions (:mod:`.decompositions`) rewrite each convolution / pool into
``permute -> circle.*_nhwc -> permute``; the layout pass (:mod:`.propagate`, ``layout_nhwc``)
moves those permutes past elementwise ops and, axes remapped (:mod:`.axes`), past reductions,
softmax, cat/split/slice, gathers and reshapes, so NHWC/NCHW pairs meet; :mod:`.fold_views`
(``fold_views``) folds reshape and permute chains, cancelling the pairs. ``nhwc_pads`` then
folds zero pads into convolutions. The passes are assembled into the pipeline by
:mod:`circle_fx.passes`; this package imports only the core and the pattern language.
"""
