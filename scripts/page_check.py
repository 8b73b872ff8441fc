"""Open a `gembench report` page in headless Chromium, offline; exit 1 on any problem it shows.

    python scripts/page_check.py PAGE [--screenshot PNG] [--colors N]   (gembench importable)

scripts/report_screenshot.sh makes the README's picture with it; the checks are
gembench.harness.report.html.browser's.
"""

import argparse
import sys
from pathlib import Path

from gembench.harness.report.html.browser import check_page, missing


def save_small_png(src: Path, dst: Path, colors: int = 128) -> int:
    """Re-encode a screenshot with a ``colors`` palette (pages are flat colours): a README-sized file."""
    from PIL import Image  # comes with matplotlib

    with Image.open(src) as im:
        im.convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(dst, optimize=True)
    return Path(dst).stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/page_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("--screenshot", type=Path, default=None, help="write a PNG of the page")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--max-height", type=int, default=None, help="cut the screenshot at this many CSS pixels")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument(
        "--min-figures", type=int, default=1, help="fewer figures than this is a problem (0 for a table page)"
    )
    parser.add_argument("--colors", type=int, default=0, help="re-encode the PNG with this many colours (smaller file)")
    args = parser.parse_args(argv)
    if not args.page.is_file():
        print(f"no page {args.page}", file=sys.stderr)
        return 2
    if lack := missing():
        print(lack, file=sys.stderr)
        return 2
    raw = args.screenshot.with_suffix(".raw.png") if args.screenshot and args.colors else args.screenshot
    check = check_page(args.page, raw, width=args.width, max_height=args.max_height, scale=args.scale)
    if raw is not None and raw != args.screenshot:
        save_small_png(raw, args.screenshot, args.colors)
        raw.unlink()
    print(f"{check.url}: {len(check.figures)} figures, page {check.page_size[0]:.0f}x{check.page_size[1]:.0f} px")
    if args.screenshot:
        print(f"screenshot: {args.screenshot} ({args.screenshot.stat().st_size / 1024:.0f} KiB)")
    problems = check.problems(args.min_figures)
    for p in problems:
        print(f"problem: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
