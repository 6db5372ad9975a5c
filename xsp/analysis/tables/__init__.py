"""The analyses' tables: each module computes one family of tables from a measurement store
(kernels, layers, memory, FLOPs, counters, ranks, program lines, ...), for the catalog to show."""
