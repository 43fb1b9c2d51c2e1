"""What a person or a GUI meets: the Game object, the GTP engine and its players, SGF, matches
between engines and ratings. The one place where a net and the GTP engine meet: play may import
gocore and nets, and only stages and flows import play."""
