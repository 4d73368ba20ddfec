"""Code the test modules share: each module here holds one topic's helpers, fixtures and
constants, so that no test file imports another."""
