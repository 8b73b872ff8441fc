"""HTML pages of results: matplotlib figures as inline SVG inside one self-contained file."""
