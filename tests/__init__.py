"""graphllm's tests, one folder per layer of the package (tests/passes/test_cost.py tests
passes/cost.py). The folders are packages so that pytest puts the repository root on sys.path
(no `pythonpath` setting) and `tests.support` can be imported; test modules never import each
other: fixtures live in conftest.py, shared code and data in tests/support/."""
