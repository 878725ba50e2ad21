"""The experiments' figures and JSON tables in the compact form they are committed in.

save_png: a matplotlib figure as a 256-colour palette PNG (Pillow's median-cut quantisation of the
rendered RGB image): line plots lose nothing visible and take a third of the bytes of the RGBA
PNG matplotlib writes. write_json: a table's JSON without indentation (the Markdown beside it is
what people read)."""
import io
import json

from PIL import Image


def save_png(fig, path, dpi):
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    buf.seek(0)
    image = Image.open(buf).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    image.save(path, format="PNG", optimize=True)


def write_json(doc, path):
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
