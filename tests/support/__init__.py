"""Code the tests share that is no test module and no fixture file: test modules import from here, never
from one another."""
