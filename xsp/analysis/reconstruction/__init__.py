"""The measurement read back as one table: spans of the level runs matched to each other
(``matching``), M's untraced steps (``untraced``), and the reconstruction that puts every level's
spans on the replay's timeline (``reconstruct``)."""
