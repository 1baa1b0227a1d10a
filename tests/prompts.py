"""Requests used by the engine tests: copy-friendly ones and open ones."""

COPY = (
    "Fix the spelling in this sentence and repeat it: The quick brwon fox jumsp over the lazy dog "
    "while the farmer watches from the porch."
)
CODE = (
    "Add a docstring to this function and return the whole function:\n\n"
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative')\n"
    "    return width * height\n"
)
TYPOS = (
    "Fix the typos in this paragraph:\n\nOur team has been working hard to improve the onboarding "
    "experiance for new customers. Previously, new users had to fill out a long form with more then "
    "twenty fields before they could see the dashboard."
)
FRANCE = "What is the capital of France?"
OPEN = "Give me two tips for sleeping better."
TABLE = (
    "Convert this list to a Markdown table with the columns Name, Role, Office and Start date:\n\n"
    "- Maria Lopez, Engineering Manager, Berlin, started March 2019\n"
    "- James Chen, Senior Backend Engineer, Berlin, started June 2020\n"
    "- Aisha Bello, Frontend Engineer, Lisbon, started January 2021\n"
    "- Tom Eriksson, Site Reliability Engineer, Stockholm, started September 2021\n"
    "- Lukas Novak, QA Engineer, Prague, started August 2022\n"
    "- Sophie Martin, Product Designer, Paris, started October 2023\n"
)
