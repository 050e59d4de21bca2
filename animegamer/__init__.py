"""AnimeGamer."""
