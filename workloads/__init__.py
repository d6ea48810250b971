"""What a model is asked and how its answers are scored: the text corpus (corpus.py: which text serves what;
haystacks.py: the shipped real-text haystack snapshots), the
task generators (tasks/: RULER and SCBench families, real-text haystacks, one registry) and the answer metrics
(metrics.py, scbench_metrics.py). A library: it imports the runtime's token helpers only, never the bench."""
