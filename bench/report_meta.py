"""The meta.tsv the bench scripts write beside their rows (`bench_meta_env` in bench/lib.sh and
each script's own lines): one `key<TAB>value` a line."""


def read_meta(path):
    meta = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("\t")
            meta[k] = v
    return meta
