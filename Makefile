# The README's two commands are `make demo` and `make test`; the logic lives
# in scripts/dev.sh so that a machine without make can run it directly.

.PHONY: venv test demo suite

venv:
	scripts/dev.sh venv

test:
	scripts/dev.sh test

# The suite only, without reinstalling (for quick iterations).
suite:
	scripts/dev.sh suite

demo:
	scripts/dev.sh demo
