PYTHON ?= python3
PIP = $(PYTHON) -m pip
STAMP = .install.stamp

.PHONY: install demo test test-fast test-slow bench clean

# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints.txt
	$(PIP) install --quiet "torch==$$(sed -n 's/^torch==//p' constraints.txt)"
	$(PIP) install --quiet -c constraints.txt -e ".[test]"
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(PYTHON) -m circle_fx.demo

test: install
	$(PYTHON) -m pytest -q -m "not slow" --hypothesis-show-statistics
	$(PYTHON) -m pytest -q -m slow

test-fast: install
	$(PYTHON) -m pytest -q -m "not slow" -x

test-slow: install
	$(PYTHON) -m pytest -q -m slow

bench: install
	$(PYTHON) benchmarks/convert_speed.py

clean:
	rm -rf $(STAMP) build *.egg-info demo_out
