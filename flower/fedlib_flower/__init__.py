"""fedlib over Flower (README, "Across sites"): the coordinator's ServerApp drives fedlib's
server strategies round by round, each site's ClientApp computes its upload with fedlib's
library on its private data; the files exchanged are the file protocol's, byte for byte."""
