"""The names of the files a run folder shares with the players and the command line: where a
champion folder keeps its checkpoint, and the run's parameters file. stages.layout names every
other path of a run; these two live here, below it, because play/ reads them too."""

CHAMPION = "champion.pt"
PARAMS = "params.yaml"
