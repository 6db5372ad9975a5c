"""The measurement rebuilt as one table: every level's spans on the replay's timeline
(``reconstruct``), and what it says of a multi-rank job's ranks and collectives
(``distributed``)."""
