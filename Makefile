# Scaling TensorFlow: the commands of the course. `make help` lists them.
#   make lab     set everything up (first time) and open the course in JupyterLab
#   make test    set everything up (first time) and run every check CI runs

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
KERNEL  = scaling-tensorflow
JOBS   ?= 2
PORT   ?= 8888
NOTEBOOK_DIRS = notebooks solutions exercises
# JupyterLab refuses to start as root (containers, some cloud machines) unless told it may.
LAB_FLAGS = $(if $(filter 0,$(shell id -u)),--allow-root)
NOTEBOOKS = $(wildcard $(addsuffix /*.ipynb,$(NOTEBOOK_DIRS)))

# Colab's stack (requirements/colab.txt) in a second environment: make test-colab-stack
COLAB_VENV  ?= .venv-colab
COLAB_BIN    = $(COLAB_VENV)/bin
COLAB_STACK  = requirements/colab.txt
# Exact pins of the course's own environment (pip constraints); see its header.
LOCK         = requirements/lock.txt

# Grading: make grade SUBMISSIONS=path/to/submissions [OUT=gradebook.csv FEEDBACK=feedback]
SUBMISSIONS ?= submissions
OUT         ?= gradebook.csv
FEEDBACK    ?= feedback
TIMEOUT     ?= 300

.PHONY: help install lab test lint stripped sync unit nbval book test-book exercises grade \
        bench doctor strip clean test-fast nbval-all test-grading unit-fast unit-and-nbval test-busy test-colab-stack test-browser \
        test-browser-classic works-where

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 12

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e ".[lab,grading,dev,book]"
	@touch $(STAMP)

install: $(STAMP)  ## create .venv (when missing) and install the course into it

lab: $(STAMP)  ## install, register the Jupyter kernel and open the course in JupyterLab
	$(BIN)/python -m ipykernel install --user --name $(KERNEL) \
		--display-name "Python (Scaling TensorFlow)" >/dev/null
	$(BIN)/jupyter lab --port $(PORT) --ServerApp.root_dir="$(CURDIR)" $(LAB_FLAGS) \
		notebooks/00_welcome.ipynb

test: lint stripped sync unit-and-nbval  ## everything CI runs: lint, notebook checks, unit tests, nbval
	@echo "make test: all checks passed"

lint: $(STAMP)  ## ruff over the package, tests, benchmarks and every notebook
	$(BIN)/ruff check .

stripped: $(STAMP)  ## notebooks are committed without outputs (nbstripout --verify)
	$(BIN)/nbstripout --verify --keep-id $(NOTEBOOKS)

sync: $(STAMP)  ## exercises/ is exactly what solutions/ generates
	$(BIN)/python -m course_utils exercises --check

# A solution passing its own check (tests marked solution_passes) is asserted for every solution
# by the Gradescope run of tests/test_grading_nbgrader.py, part of make unit and make test.
ALSO_GRADED = -m "not solution_passes"

unit: $(STAMP)  ## pytest: the package, layout and conventions, grader, trainer, clusters
	$(BIN)/python -m pytest tests -n $(JOBS) --dist loadfile --no-loadscope-reorder $(ALSO_GRADED)

test-fast: lint stripped sync unit-fast  ## between small changes: test without slow tests and nbval
	@echo "make test-fast: all fast checks passed (make test runs everything)"

unit-fast: $(STAMP)  ## pytest without the tests marked slow
	$(BIN)/python -m pytest tests -n $(JOBS) --dist loadfile --no-loadscope-reorder -m "not slow"

NBVAL = $(BIN)/python -m pytest --nbval-lax --nbval-current-env -n $(JOBS) --dist loadfile --no-loadscope-reorder \
	--nbval-cell-timeout=600 --nbval-kernel-startup-timeout=120

# make test executes every exercise notebook blank (as committed) and fully solved under the
# Gradescope autograder (lesson 00 half solved too; make test-grading: every lesson), and lesson
# 00's under nbgrader as well; tests/test_grading_nbgrader.py
# fails where any of those runs raised outside a check cell or a cell tagged raises-exception,
# which is what nbval asserts. So nbval runs the lessons here; nbval-all runs every notebook.
nbval: $(STAMP)  ## execute every lesson notebook (nbval, lax mode); exercises: see above
	$(NBVAL) notebooks

# One pytest run for both, so that neither core waits at the end of the unit tests while the
# other finishes their longest file: conftest.py hands out the longest files and notebooks first.
# TEST_JOBS workers, one more than CI's 2 cores: many checks and lessons wait (simulated
# storage and device latency, servers starting, timeouts), and a worker alone kept one core
# busy about 70 % of the time (test_checks_lesson_01/08 alone, AMD EPYC, 2 cores). Five check
# files and three lessons: 304 s with 2 workers, 208 s with 3, the same CPU time (251 and 261 s).
# A fresh-clone make test, 3 workers: 880 s (pytest 812 s, 1,475 CPU-s, 167 % of 2 cores; a
# few minutes of other tests ran beside it), 2783 passed and 63 routes skipped (e89044b).
# 4 workers, on a machine shared with other jobs: 1171, 1245 and 1204 s; the last failed lesson
# 01's CPU-bound timing assert (x4.30 on 2 CPUs), so 3 until 4 is timed and busy-tested quietly.
TEST_JOBS ?= 3
unit-and-nbval: $(STAMP)  ## make unit and make nbval in one pytest run (what make test runs)
	$(NBVAL) -n $(TEST_JOBS) $(ALSO_GRADED) tests notebooks

# make test runs the first wrong answer of each rejection in the long catalogues of lessons 02,
# 03 and 04 (tests/tools/catalogue_routes.py); test-grading runs every route to each as well.
test-grading: $(STAMP)  ## the grading tests and every check's whole catalogue, nbgrader on every lesson (long)
	COURSE_NBGRADER_LESSONS=all COURSE_FULL_CATALOGUES=1 $(BIN)/python -m pytest -n $(JOBS) \
		--dist loadfile --no-loadscope-reorder tests/test_grading_nbgrader.py \
		tests/test_gradescope.py tests/test_grading_grader.py tests/test_checks_lesson_*.py

nbval-all: $(STAMP)  ## execute every notebook under nbval; solutions with strict checks
	COURSE_STRICT_CHECKS=1 $(NBVAL) solutions
	$(NBVAL) notebooks exercises

# Two processes spin the cores in random bursts (tests/tools/busy.py) while nbval runs; the
# script stops them however the run ends. BUSY_SECONDS bounds their life (default 3600 s).
test-busy: $(STAMP)  ## lessons and solutions under nbval while 2 processes load the cores in bursts
	tests/tools/with_busy_cores.sh $(BIN)/python sh -c \
		'COURSE_STRICT_CHECKS=1 $(NBVAL) solutions && $(NBVAL) notebooks'

# make book: the course as a book in _build/book (Sphinx, MyST-NB, sphinx-book-theme; builds
# offline). Every notebook is executed once; results are cached in _build/book_cache, so a
# rebuild re-runs only the notebooks that changed. Warnings are errors: a failing cell, a broken
# cross-reference or a missing image fails the build. BOOK_SOLUTIONS=0 leaves the solutions out
# (a public build); BOOK_EXECUTE=off builds without running anything (quick, outputs empty).
BOOK_DIR      ?= _build/book
BOOK_SOLUTIONS ?= 1
BOOK_EXECUTE   ?= cache

book: $(STAMP)  ## the course as a searchable book in _build/book (executes every notebook once)
	BOOK_SOLUTIONS=$(BOOK_SOLUTIONS) BOOK_EXECUTE=$(BOOK_EXECUTE) $(BIN)/sphinx-build -b html \
		-c docs/book -W --keep-going -q . $(BOOK_DIR)
	@echo "open $(BOOK_DIR)/index.html"

# make test-browser: each lesson in JupyterLab in headless Chromium (Debian's chromium and
# chromium-driver, no browser download), driven by selenium from a small venv of its own.
# BROWSER_NOTEBOOKS="notebooks/01_input_pipelines.ipynb ..." picks lessons; screenshots: _build/browser
BROWSER_VENV      ?= .venv-browser
BROWSER_NOTEBOOKS ?= $(wildcard notebooks/*.ipynb)
SELENIUM           = selenium==4.51.0

$(BROWSER_VENV)/.installed: $(LOCK)
	@test -x $(BROWSER_VENV)/bin/python || $(PYTHON) -m venv $(BROWSER_VENV)
	$(BROWSER_VENV)/bin/python -m pip install --quiet -c $(LOCK) pytest $(SELENIUM)
	@touch $@

CHROMIUM_CHECK = @test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { echo "$@ needs \
	Debian's browser: apt-get install -y chromium chromium-driver"; exit 1; }

test-browser: $(STAMP) $(BROWSER_VENV)/.installed  ## run every lesson in JupyterLab in headless Chromium
	$(CHROMIUM_CHECK)
	COURSE_BROWSER_TESTS=1 COURSE_JUPYTER="$(CURDIR)/$(BIN)/jupyter" \
		BROWSER_NOTEBOOKS="$(BROWSER_NOTEBOOKS)" $(BROWSER_VENV)/bin/python -m pytest \
		tests/browser/test_browser_page_checks.py tests/browser/test_lessons_in_browser.py \
		--confcutdir=tests/browser -p no:cacheprovider -v -s

# make test-browser-classic: the widget lessons (those calling cu.widgets.*_widget) with Colab's
# widget versions, in the classic Notebook 6.5 of .venv-colab (ipywidgets 7.7.1,
# widgetsnbextension 3.6.10; Colab's own front end cannot run here); screenshots:
# _build/browser/classic. BROWSER_CLASSIC_NOTEBOOKS="notebooks/01_input_pipelines.ipynb" picks.
BROWSER_CLASSIC_NOTEBOOKS ?=

test-browser-classic: $(COLAB_VENV)/.installed $(BROWSER_VENV)/.installed  ## the widget lessons in classic Notebook 6.5 (ipywidgets 7.7) in headless Chromium
	$(CHROMIUM_CHECK)
	COURSE_BROWSER_TESTS=1 COURSE_CLASSIC_JUPYTER="$(CURDIR)/$(COLAB_BIN)/jupyter" \
		BROWSER_CLASSIC_NOTEBOOKS="$(BROWSER_CLASSIC_NOTEBOOKS)" $(BROWSER_VENV)/bin/python \
		-m pytest tests/browser/test_widget_lessons_in_classic_notebook.py \
		--confcutdir=tests/browser -p no:cacheprovider -v -s

# make test-book: the built book in headless Chromium (as test-browser): landing page, every page
# of the table of contents without console errors and with its images, next/previous in course
# order, search, HTML result tables; screenshots in _build/browser/book.
test-book: book $(BROWSER_VENV)/.installed  ## build the book, then check it in headless Chromium
	$(CHROMIUM_CHECK)
	COURSE_BROWSER_TESTS=1 BOOK_DIR="$(BOOK_DIR)" $(BROWSER_VENV)/bin/python -m pytest \
		tests/browser/test_book_in_browser.py --confcutdir=tests/browser -p no:cacheprovider -v -s

exercises: $(STAMP)  ## generate exercises/ from solutions/
	$(BIN)/python -m course_utils exercises

grade: $(STAMP)  ## grade a folder of submissions: make grade SUBMISSIONS=dir [OUT= FEEDBACK=]
	$(BIN)/python -m course_utils grade "$(SUBMISSIONS)" --solutions solutions \
		--out "$(OUT)" --feedback "$(FEEDBACK)" --timeout $(TIMEOUT) --jobs $(JOBS)

bench: $(STAMP)  ## run the benchmarks; results as JSON in benchmarks/results/
	@for script in benchmarks/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

works-where: $(STAMP)  ## rerun every API under every strategy; rewrite docs/what_works_where.md and the README's table
	$(BIN)/python -m course_utils works-where --write

doctor: $(STAMP)  ## report this machine's hardware and what each lesson can use
	$(BIN)/python -m course_utils doctor

strip: $(STAMP)  ## strip outputs from every notebook before committing
	$(BIN)/nbstripout --keep-id $(NOTEBOOKS)

# Colab's packages first, then the course exactly as the Colab install cell does (no constraint:
# the ranges must keep Colab's versions), then the test tools without moving Colab's packages.
$(COLAB_VENV)/.installed: $(COLAB_STACK) pyproject.toml
	@test -x $(COLAB_BIN)/python || $(PYTHON) -m venv $(COLAB_VENV)
	$(COLAB_BIN)/python -m pip install --quiet --upgrade pip
	$(COLAB_BIN)/python -m pip install --quiet -r $(COLAB_STACK)
	$(COLAB_BIN)/python -m pip install --quiet -e .
	$(COLAB_BIN)/python -m pip install --quiet -c $(COLAB_STACK) -e ".[grading]" \
		pytest pytest-xdist pytest-timeout nbval
	@touch $@

COLAB_NBVAL = $(COLAB_BIN)/python -m pytest --nbval-lax --nbval-current-env -n $(JOBS) \
	--dist loadfile --no-loadscope-reorder --nbval-cell-timeout=600 --nbval-kernel-startup-timeout=120

test-colab-stack: $(COLAB_VENV)/.installed  ## unit tests and lessons on Colab's versions (.venv-colab)
	COURSE_COLAB_STACK=$(COLAB_STACK) $(COLAB_BIN)/python -m pytest -q \
		tests/test_dependencies.py::test_this_environment_is_colabs_stack
	$(COLAB_BIN)/python -m pytest tests -n $(JOBS) --dist loadfile --no-loadscope-reorder
	COURSE_STRICT_CHECKS=1 $(COLAB_NBVAL) solutions
	$(COLAB_NBVAL) notebooks exercises
	@echo "make test-colab-stack: the course passes on Colab's stack"

clean:  ## remove build outputs (keeps .venv)
	rm -rf _build .pytest_cache .ruff_cache benchmarks/results
