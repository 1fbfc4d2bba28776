# The PyPI versions the Python tests' torch 2.x tier runs on, sourced by
# scripts/torch2_env.sh (the test command's environment) and
# scripts/test_wheel.sh (the wheel's fresh environment).
torch2_pins=(torch==2.11.0 torchvision==0.26.0 timm==1.0.31 numpy==2.4.6 pytest==9.2.0)
