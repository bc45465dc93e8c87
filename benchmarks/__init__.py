"""`goqueue bench` and what only it uses: the load generator and the bench actors.

Not installed with the package: run it from a checkout (`python -m benchmarks`, or
`goqueue bench` from an editable install).
"""
