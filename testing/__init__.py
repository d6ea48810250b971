"""Test support, in one place: what the tests, the benchmarks and the scripts share, and no library needs.

- :mod:`testing.tiny_models`: a tiny random model of every family, built from its adapter's tiny configs;
- :mod:`testing.offline`: every registered press and allocator, built without any file or download;
- :mod:`testing.kvpress_parity`, :mod:`testing.kvzip_parity`: this project's presses against kvpress's own caches.

It may import any package of the project; none of them imports it (``tests/test_import_graph.py``).
"""
