"""Code the test modules share: no tests here, and no test module imports another."""
