"""Shard formats: how one shard object holds its chunks and finds them again."""
