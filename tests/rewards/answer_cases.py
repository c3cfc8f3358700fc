"""Hand-written answer-checking cases (our own problems): (completion, gold answer field, expected match)."""

GSM8K_GOLD = {
    "apples": "Maya buys 3 bags of 12 apples: 3 * 12 = <<3*12=36>>36 apples.\nShe eats 4, so 36 - 4 = <<36-4=32>>32.\n#### 32",
    "money": "Each ticket costs $15 and 80 are sold: 15 * 80 = <<15*80=1200>>1200.\n#### 1,200",
    "neg": "The temperature drops 9 degrees from 4: 4 - 9 = -5.\n#### -5",
    "half": "Split 7 liters into 2 equal jugs: 7 / 2 = 3.5 liters each.\n#### 3.5",
    "big": "1250 * 8 = 10000 bricks.\n#### 10000",
}

# (completion, gold key or literal gold, expected)
GSM8K_CASES = [
    # answer tags
    ("<think>3*12=36, minus 4 is 32</think><answer>32</answer>", "apples", True),
    ("<think>36-4</think><answer>31</answer>", "apples", False),
    ("<think>...</think><answer>$1,200</answer>", "money", True),
    ("<think>...</think><answer>1200 dollars</answer>", "money", True),
    ("<think>...</think><answer>The total is $1,200.00.</answer>", "money", True),
    ("<answer>−5</answer>", "neg", True),                      # unicode minus
    ("<answer>-5 degrees</answer>", "neg", True),
    ("<answer>5</answer>", "neg", False),
    ("<answer>3.50 liters</answer>", "half", True),
    ("<answer>7/2</answer>", "half", True),
    ("<answer>3</answer>", "half", False),
    ("<answer>32.0</answer>", "apples", True),                  # trailing .0
    ("<answer>10,000</answer>", "big", True),
    ("<answer>1,0000</answer>", "big", False),                 # not a thousands separator: reads 1 then 0
    # several answer tags: the last complete one counts
    ("<answer>30</answer> wait, recount. <answer>32</answer>", "apples", True),
    ("<answer>32</answer> hmm no <answer>33</answer>", "apples", False),
    # an answer tag without a number is no answer, even if the reasoning has the right number
    ("I think it is 32 <answer>thirty-two</answer>", "apples", False),
    # #### lines
    ("3 bags * 12 = 36, 36 - 4 = 32\n#### 32", "apples", True),
    ("36 - 4 = 32\n#### 32 apples\nCheck: 32 + 4 = 36", "apples", True),    # numbers after the answer
    ("#### 1200\n", "money", True),
    ("#### 31\nActually 32", "apples", False),                 # the marker decides
    # \boxed
    ("So she has \\boxed{32} apples. Check: 32 + 4 = 36.", "apples", True),
    ("The answer is $\\boxed{\\$1,200}$.", "money", True),
    ("\\boxed{30} ... no, \\boxed{32}", "apples", True),
    ("\\boxed{-5}", "neg", True),
    # last number fallback
    ("She has 36 - 4 = 32 apples.", "apples", True),
    ("She started with 36 apples and ate 4.", "apples", False),
    ("It drops to −5 degrees", "neg", True),
    ("The jugs each hold 3.5", "half", True),
    ("The answer is 1200. Each of the 80 tickets", "money", False),      # a number after the answer wins
    ("", "apples", False),                                     # empty completion
    ("   \n  ", "neg", False),
    ("no numbers here", "big", False),
    ("3-5", "neg", False),                                     # subtraction, not a negative five
    # gold given as a plain number (datasets without ####)
    ("<answer>42</answer>", "42", True),
    ("<answer>42</answer>", 42, True),
    ("<answer>0.25</answer>", "1/4", True),
]

MATH_GOLD_SOLUTION = (
    "We complete the square: $x^2 - 6x + 9 = (x-3)^2$, so the minimum is at $x = \\boxed{3}$.")

# (completion, gold answer string, expected)
MATH_CASES = [
    ("The result is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", True),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12", True),
    ("\\boxed{1/2}", "\\frac{1}{2}", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{.5}", "0.5", True),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", True),            # equal values
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
    ("\\boxed{-\\frac{3}{4}}", "-\\frac34", True),
    ("\\boxed{\u2212\\frac{3}{4}}", "-\\frac{3}{4}", True),       # unicode minus
    ("\\boxed{\\frac{-3}{4}}", "-\\frac{3}{4}", True),
    ("\\boxed{5\\text{ cm}}", "5", True),                       # trailing unit
    ("\\boxed{\\text{(B)}}", "\\text{(B)}", True),
    ("\\boxed{(B)}", "\\text{(B)}", True),
    ("\\boxed{25\\%}", "25", True),
    ("\\boxed{25}", "25\\%", True),
    ("\\boxed{90^\\circ}", "90", True),
    ("\\boxed{90^{\\circ}}", "90^\\circ", True),
    ("\\boxed{\\left( 2, 3 \\right)}", "(2,3)", True),
    ("\\boxed{(3, 2)}", "(2,3)", False),
    ("\\boxed{x = 3}", "3", True),
    ("\\boxed{3.}", "3", True),                                 # trailing period
    ("\\boxed{1{,}000}", "1000", True),
    ("\\boxed{\\$4.50}", "4.5", True),
    ("\\boxed{2\\sqrt2}", "2\\sqrt{2}", True),
    ("\\boxed{\\sqrt{2}}", "2\\sqrt{2}", False),
    ("\\boxed{x^2 + 2x + 1}", "x^2+2x+1", True),                # spaces
    # nested braces inside the box
    ("So $\\boxed{\\frac{\\sqrt{3}}{2}}$ is it.", "\\frac{\\sqrt{3}}{2}", True),
    ("\\boxed{\\{1, 2\\}}", "\\{1,2\\}", True),
    ("\\boxed{2^{10}}", "2^{10}", True),
    # several boxed answers: the last one counts
    ("First guess \\boxed{4}, but recheck: \\boxed{3}.", "3", True),
    ("\\boxed{3} is wrong; it is \\boxed{4}", "3", False),
    ("\\fbox{7}", "7", True),
    # numbers after the boxed answer do not matter
    ("Hence \\boxed{12}. Verify: 3 * 4 = 12, and 13 - 1 = 12, 99", "12", True),
    # no box: no answer
    ("The answer is 12.", "12", False),
    ("", "12", False),
    ("\\boxed{}", "12", False),
    ("\\boxed{12", "12", False),                                # never closed
    # answer tags take precedence over boxes outside them
    ("<think>maybe \\boxed{5}</think><answer>\\boxed{6}</answer>", "6", True),
    ("<think>\\boxed{6}</think><answer>5</answer>", "6", False),
    ("<think>...</think><answer>\\frac{1}{2}</answer>", "0.5", True),
    # gold taken from a full solution's last box
    ("\\boxed{3}", MATH_GOLD_SOLUTION, True),
    ("\\boxed{9}", MATH_GOLD_SOLUTION, False),
]
