"""Knowledge of the systems around modeltap: upstream layouts and error shapes, AReaL versions,
client quirks, and `modeltap doctor`. Imports nothing else of modeltap."""
