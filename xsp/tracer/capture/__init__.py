"""Capture, the hot path: sessions, the levels (M, F, L, G) that append raw records, the GPU monitor and CUPTI's one owner."""
