"""The demo implementer: replays prepared changes, one per feature; it is not an AI.

The first attempt at `discount` is deliberately wrong so that a visitor sees a failed
validation, a generated fix feature and a pass. Point the mission's `executor_command`
at a real coding agent to do real work instead.
"""

import os
import pathlib
import sys

CHANGES = {
    "cart-total": {"shop/cart.py": "def cart_total(items):\n    return sum(price * qty for price, qty in items)\n"},
    "cart-count": {"shop/count.py": "def item_count(items):\n    return sum(qty for _price, qty in items)\n"},
    "discount": {
        "shop/discount.py": "def apply_discount(total, percent):\n    return total - percent  # wrong: subtracts the percentage as money\n"
    },
    "discount-fix": {
        "shop/discount.py": "def apply_discount(total, percent):\n    return round(total * (100 - percent) / 100, 2)\n"
    },
    "receipt": {
        "shop/receipt.py": "from shopmoney import money\n\nfrom shop.cart import cart_total\n\n\n"
        "def receipt(items):\n"
        "    lines = [f'{qty} x {money(price)}' for price, qty in items]\n"
        "    return '\\n'.join(lines + [f'TOTAL {money(cart_total(items))}'])\n"
    },
}


def main() -> int:
    key = os.environ.get("FUSION_FEATURE_KEY", "")
    prompt = pathlib.Path(os.environ["FUSION_TASK_PROMPT_FILE"]).read_text()
    change = CHANGES.get(key)
    if change is None and "-fix-" in key:
        change = CHANGES.get(key.split("-fix-")[0] + "-fix")
    if change is None:
        print(f"no prepared change for {key}", file=sys.stderr)
        return 1
    for rel, text in change.items():
        path = pathlib.Path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {rel} for {key} ({len(prompt)} characters of prompt read)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
