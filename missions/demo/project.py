"""The demo's real Python project (a tiny shop) and its mission file. The shop formats
money with a package it installs from a wheel it carries (`WHEELS`), in the environment
its mission declares: built once, offline, in the sandbox (docs/ENVIRONMENTS.md)."""

from typing import Any

from missions.demo.wheel import wheel, wheel_name

# The package the receipt formats money with, in the repository's `wheels/`.
MONEY = {"shopmoney.py": "def money(amount):\n    return f'{amount:.2f}'\n"}
WHEELS = {f"wheels/{wheel_name('shopmoney', '1.0')}": wheel("shopmoney", "1.0", MONEY)}

TESTS = {
    "shop/__init__.py": "",
    "tests/__init__.py": "",
    "tests/test_cart.py": "import unittest\n\n\nclass CartTests(unittest.TestCase):\n"
    "    def test_total(self):\n        from shop.cart import cart_total\n"
    "        self.assertEqual(cart_total([(2.5, 2), (1.0, 3)]), 8.0)\n\n"
    "    def test_empty(self):\n        from shop.cart import cart_total\n"
    "        self.assertEqual(cart_total([]), 0)\n",
    "tests/test_count.py": "import unittest\n\n\nclass CountTests(unittest.TestCase):\n"
    "    def test_count(self):\n        from shop.count import item_count\n"
    "        self.assertEqual(item_count([(2.5, 2), (1.0, 3)]), 5)\n",
    "tests/test_discount.py": "import unittest\n\n\nclass DiscountTests(unittest.TestCase):\n"
    "    def test_ten_percent(self):\n        from shop.discount import apply_discount\n"
    "        self.assertEqual(apply_discount(200, 10), 180)\n",
    "tests/test_receipt.py": "import unittest\n\n\nclass ReceiptTests(unittest.TestCase):\n"
    "    def test_receipt(self):\n        from shop.receipt import receipt\n"
    "        self.assertIn('TOTAL 8.00', receipt([(2.5, 2), (1.0, 3)]))\n",
    "requirements.txt": "shopmoney==1.0\n",
    "README.md": "# Tiny shop\n\nThe demo project of Fusion Missions.\n",
}


def unittest_check(test: str) -> dict:
    return {"run": f"python -m unittest -q {test}", "timeout": 60}


# A mission file as the importer reads it (docs/MISSION_FILES.md).
MISSION: dict[str, Any] = {
    "mission": {
        "key": "demo",
        "title": "Demo: a tiny shop",
        "description": "Built by the demo implementer, judged by real checks.",
        "validator": "composite",
        "executor": "command",
        "autopilot": True,
        "auto_fix": True,
        "retry_budget": 3,
        # The tests came first (the base revision): an implementation cannot pass by editing them.
        "protected_paths": ["tests/**"],
        # Its dependency, from the wheel the repository carries: no network needed.
        "environment": {
            "preset": "python",
            "setup": ["pip install --no-index --find-links wheels -r requirements.txt"],
            "key_files": ["requirements.txt", "wheels"],
        },
    },
    "milestones": [
        {
            "key": "cart",
            "title": "Cart",
            "assertions": [
                {
                    "key": "VAL-CART-001",
                    "title": "Cart total multiplies price by quantity",
                    "statement": "cart_total([(2.5,2),(1,3)]) == 8",
                    "check": unittest_check("tests.test_cart"),
                },
                {
                    "key": "VAL-CART-002",
                    "title": "Item count sums quantities",
                    "statement": "item_count([(2.5,2),(1,3)]) == 5",
                    "check": unittest_check("tests.test_count"),
                },
                {
                    "key": "VAL-CART-003",
                    "title": "The cart module exists",
                    "statement": "shop/cart.py defines cart_total",
                    "check": {"file": "shop/cart.py", "contains": r"def cart_total\("},
                },
            ],
            "slices": [
                {
                    "key": "totals",
                    "title": "Totals",
                    "features": [
                        {
                            "key": "cart-total",
                            "title": "Cart total",
                            "description": "Sum price x quantity.",
                            "assertions": ["VAL-CART-001", "VAL-CART-003"],
                        },
                        {
                            "key": "cart-count",
                            "title": "Item count",
                            "description": "Count items.",
                            "assertions": ["VAL-CART-002"],
                        },
                    ],
                },
            ],
        },
        {
            "key": "checkout",
            "title": "Checkout",
            "dependencies": ["cart"],
            "assertions": [
                {
                    "key": "VAL-DISC-001",
                    "title": "A percentage discount",
                    "statement": "apply_discount(200, 10) == 180",
                    "check": unittest_check("tests.test_discount"),
                },
                {
                    "key": "VAL-RCPT-001",
                    "title": "Receipt shows the total",
                    "statement": "receipt ends with TOTAL",
                    "check": unittest_check("tests.test_receipt"),
                },
            ],
            "slices": [
                {
                    "key": "discounts",
                    "title": "Discounts",
                    "features": [
                        {
                            "key": "discount",
                            "title": "Percentage discount",
                            "description": "apply_discount(total, percent).",
                            "assertions": ["VAL-DISC-001"],
                        },
                    ],
                },
                {
                    "key": "receipts",
                    "title": "Receipts",
                    "features": [
                        {
                            "key": "receipt",
                            "title": "Receipt",
                            "description": "A text receipt.",
                            "assertions": ["VAL-RCPT-001"],
                        },
                    ],
                },
            ],
        },
    ],
}
